"""Real datasets: the data home, verified fetching, and loaders.

>>> from ebfl.datasets import data_home
>>> data_home().name != ""
True
"""

from ebfl.datasets._home import data_home, dataset_path, fetch, manifest, sha256
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
)
from ebfl.datasets.hapt_uci import fetch_uci_hapt, read_uci_hapt_zip

__all__ = ["ACTIVITIES", "ELECTION_YEARS", "ElectionMatrix", "data_home", "dataset_path",
           "election_matrix", "feature_names", "fetch", "fetch_uci_hapt", "hapt_windows",
           "load_county_returns", "load_hapt_raw", "manifest", "read_uci_hapt_zip", "sha256",
           "split_first_run", "tidy_county_returns"]
