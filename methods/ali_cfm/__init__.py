"""ALI-CFM: multi-marginal flow matching with adversarially learnt interpolants (being built).

So far: `data.py` (the trimodal, knot, rotating-GMM and krumsiek11 marginals, min-max
normalised, and the leave-one-out split of the official evaluation); `nets.py` (the interpolant
G, the discriminator and the velocity field as pure functions); `losses.py` (pretraining, the
GAN pair with its regularisers, the CFM loss on the frozen interpolant, the baselines' losses);
`paths.py` (the baselines' linear, piecewise-linear and cubic-spline paths).
"""
