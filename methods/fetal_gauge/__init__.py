"""Fetal-Gauge (paper 16): a VQA benchmark harness for fetal ultrasound (issue 45; in progress)."""
