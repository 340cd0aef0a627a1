"""Real datasets: the data home, verified fetching, and loaders.

>>> from ebfl.datasets import data_home
>>> data_home().name != ""
True
"""

from ebfl.datasets._home import (
    content_sha256,
    data_home,
    dataset_file,
    dataset_path,
    fetch,
    manifest,
    sha256,
)
from ebfl.datasets.cifar import (
    CIFAR10_C_CORRUPTIONS,
    CIFAR10_CLASSES,
    load_cifar10,
    load_cifar10_1,
    load_cifar10_c,
    load_cifar100,
)
from ebfl.datasets.elections import (
    ELECTION_YEARS,
    ElectionMatrix,
    election_matrix,
    load_county_returns,
    tidy_county_returns,
)
from ebfl.datasets.hapt import (
    ACTIVITIES,
    feature_names,
    hapt_windows,
    load_hapt_raw,
    split_first_run,
    standardized_clients,
)
from ebfl.datasets.hapt_uci import fetch_uci_hapt, read_uci_hapt_zip
from ebfl.datasets.idx import (
    FASHION_MNIST_CLASSES,
    MNIST_CLASSES,
    LabelledImages,
    load_fashion_mnist,
    load_mnist,
    read_idx,
)
from ebfl.datasets.leaf import (
    FEMNIST_CLASSES,
    FemnistClients,
    LeafFemnist,
    femnist_clients,
    fetch_leaf_femnist,
    load_leaf_femnist,
)
from ebfl.datasets.tff_emnist import (
    TFF_EMNIST_FILES,
    TffEmnist,
    load_tff_emnist,
    tff_emnist_writers,
)
from ebfl.datasets.uci_har import load_uci_har, read_uci_har_zip

__all__ = ["ACTIVITIES", "CIFAR10_CLASSES", "CIFAR10_C_CORRUPTIONS", "ELECTION_YEARS",
           "ElectionMatrix", "FASHION_MNIST_CLASSES", "FEMNIST_CLASSES", "FemnistClients",
           "LabelledImages", "LeafFemnist", "MNIST_CLASSES", "TFF_EMNIST_FILES", "TffEmnist",
           "content_sha256", "data_home", "dataset_file", "dataset_path", "election_matrix",
           "feature_names", "femnist_clients", "fetch", "fetch_leaf_femnist", "fetch_uci_hapt",
           "hapt_windows", "load_cifar10", "load_cifar100", "load_cifar10_1", "load_cifar10_c",
           "load_county_returns", "load_fashion_mnist", "load_hapt_raw", "load_leaf_femnist",
           "load_mnist", "load_tff_emnist", "load_uci_har", "manifest", "read_idx",
           "read_uci_hapt_zip", "read_uci_har_zip", "sha256",
           "split_first_run", "standardized_clients",
           "tff_emnist_writers", "tidy_county_returns"]
