"""RLCR (paper 1): GRPO with a Brier-score term so verbalized confidence becomes calibrated.

- `rewards.py`: RLVR and RLCR rewards (and a log-score variant that breaks the correctness
  incentive) as pure, jittable functions of parsed per-sample quantities.
- `calibration.py`: accuracy, ECE (10 equal-width bins), Brier score, AUROC and reliability-
  diagram data for confidences against correctness.
"""
