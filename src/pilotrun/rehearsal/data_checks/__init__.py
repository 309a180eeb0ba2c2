"""Data checks: validate (the campaign file and every record), inspect (what the loss sees), leakage."""
