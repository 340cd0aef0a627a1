"""DP-PFL: private multitask personalized learning with a learned task relationship.

DP-PFL (Hu et al., IEEE IoT J. 2020) gives every device its own linear model
w_t, couples the devices through a task covariance Omega learned with them
(the MOCHA formulation), and trains by distributed dual coordinate ascent in
which every device adds Gaussian noise to what it shares:

* :mod:`ebfl.dppfl.objective`: problem (1), its dual (5), the map (6), the
  closed-form Omega-step;
* :mod:`ebfl.dppfl.algorithm`: Algorithm 1 (:func:`fit_dppfl`), with device
  variability and dropping, private or not;
* :mod:`ebfl.dppfl.accounting`: Theorem 5's noise calibration beside a
  rigorous accountant;
* :mod:`ebfl.dppfl.theory`: the lemmas and theorems as computable checks,
  on the exact minimizers of :mod:`ebfl.dppfl.exact`;
* :mod:`ebfl.dppfl.checks`: the ``dppfl_*`` rows of ``ebfl validate``;
* :mod:`ebfl.dppfl.data`: devices' data (:class:`DeviceData`) and the
  paper's smartphone task;
* :mod:`ebfl.dppfl.federated`: the same algorithm on ebfl's two runtimes
  (in process and Flower);
* :mod:`ebfl.dppfl.experiment`: ``ebfl reproduce dp-pfl`` (Figures 2-5).
"""

from ebfl.dppfl.accounting import (
    CalibrationConditionWarning,
    Theorem5Calibration,
    calibrate_rdp,
    calibrate_theorem5,
    corollary4_epsilon,
    dppfl_privacy_report,
    releases_of,
    rigorous_epsilon,
)
from ebfl.dppfl.algorithm import (
    DPPFLResult,
    PrivacySetting,
    dual_sensitivity,
    exchangeable_omega,
    fit_dppfl,
    sampling_rates,
    test_error,
)
from ebfl.dppfl.data import DeviceData, har_sitting_devices, l2_normalize
from ebfl.dppfl.federated import DPPFL
from ebfl.dppfl.objective import (
    dual_objective,
    duality_gap,
    omega_step,
    primal_dual_map,
    primal_objective,
)

__all__ = ["calibrate_rdp", "calibrate_theorem5", "CalibrationConditionWarning",
           "corollary4_epsilon", "DeviceData", "DPPFL", "dppfl_privacy_report", "DPPFLResult",
           "dual_objective", "dual_sensitivity", "duality_gap", "exchangeable_omega", "fit_dppfl",
           "har_sitting_devices", "l2_normalize", "omega_step", "primal_dual_map",
           "primal_objective", "PrivacySetting", "releases_of", "rigorous_epsilon",
           "sampling_rates", "test_error", "Theorem5Calibration"]
