"""The `clef-bridge` command and the tools beyond serving: check, pair, fit, pull, split, join, decide,
eval, calibrate, drift, bench."""
