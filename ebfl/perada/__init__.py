"""PerAda: parameter-efficient personalization with generalization guarantees.

Everything that is the PerAda paper's (Xie et al., CVPR 2024) is in this package:

* :mod:`ebfl.perada.algorithm`: PerAda (Algorithm 1) and PerAda w/o KD, in torch;
* :mod:`ebfl.perada.dp`: DP-PerAda and DP-Ditto (client-level DP-SGD, Table 4);
* :mod:`ebfl.perada.generalization`: the generalization metrics of Table 2;
* :mod:`ebfl.perada.data`: its federations (CIFAR-10 label skew, CheXpert-like);
* :mod:`ebfl.perada.experiment`: ``ebfl reproduce perada`` (Tables 1, 2, 4, Figures 4, 7).

The torch modules import torch when they are imported; this package itself does
not (``pip install 'ebfl[learning]'`` for them). What PerAda shares with other
algorithms is in the library layers: the server distillation and frozen-backbone
helpers (:mod:`ebfl.learning.torch.distillation`), the residual adapters and ResNets
(:mod:`ebfl.learning.torch.adapters`) and their pretrained backbones
(:mod:`ebfl.learning.torch.pretrain`), the partial-model baselines
(:mod:`ebfl.learning.torch.partial`), DP-SGD (:mod:`ebfl.learning.torch.dp_sgd`) and the
label-skew partition (:func:`ebfl.learning.partition.dirichlet_least_samples`).
"""

__all__: list[str] = []
