"""The serving twin: a calibrated simulator of disaggregated and colocated serving, and emulated engines."""
