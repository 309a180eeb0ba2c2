"""Reading data files with exact error locations; label checks, leakage and splitting."""
