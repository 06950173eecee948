"""ALI-CFM: multi-marginal flow matching with adversarially learnt interpolants (being built).

So far only `data.py`: the trimodal, knot, rotating-GMM and krumsiek11 marginals, min-max
normalised, and the leave-one-out split of the official evaluation.
"""
