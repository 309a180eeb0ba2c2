"""The ground floor's voice: terminal-safe text and the progress line, usable from every layer."""
