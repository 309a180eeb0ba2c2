"""The selection sheet: GPU catalogue, memory and time plan, software stack, rendering."""
