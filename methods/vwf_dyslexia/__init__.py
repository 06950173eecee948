"""Inducing dyslexia in a vision-language model (paper 6, NOTES-a.md section 6; issue 23).

- `stimuli.py`: real words (PyPI english-words), bigram-chain pseudowords with dictionary
  exclusion, Pillow rendering in matplotlib's fonts, the localiser categories (words,
  scrambled words, line faces, line objects), a shape-comparison task and sentence-picture
  matching; grey 32 x 128 images in [-1, 1], deterministic per seed.

The model is the shared `core.nn.vlm` (ViT -> linear merger -> decoder LM) with its decoder
MLPs' gate pre-activations captured and lesioned by a unit mask (`gate_mask_LF`).
"""
