"""DEQL (paper 8, NOTES-b.md section 8): linear-autoencoder recommenders in closed form.

- `data.py`: MovieLens-100k (the recbole wheel's ml-100k.inter, or GroupLens u.data), binarised
  at rating >= 4, as scipy CSR user x item matrices; seeded strong- (held-out users, 80 %
  fold-in) and weak-generalisation splits.
- `solvers.py`: the Gram matrix (one device, or users sharded over a mesh with a psum); EASE,
  EDLAE (b = 0) and DEQL (b > 0; plain, L2, L2 + zero diagonal) by the vectorised Miller /
  Sherman-Morrison algorithm, its O(n^4) direct oracle, and the analytic expected loss.
- `metrics.py`: Recall@k (normalised by min(k, #held-out)) and NDCG@k with fold-in items masked.
"""
