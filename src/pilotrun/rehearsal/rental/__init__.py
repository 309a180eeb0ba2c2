"""The rental: the sheet (GPU, memory, time and cost plan) and the environment report."""
