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

__all__ = ["ACTIVITIES", "ELECTION_YEARS", "feature_names", "hapt_windows", "load_hapt_raw",
           "split_first_run", "ElectionMatrix", "data_home", "dataset_path", "election_matrix",
           "fetch", "load_county_returns", "manifest", "sha256", "tidy_county_returns"]
