"""Moved: the autoscaling loop is :mod:`disagg.controller.autoscaler` (evaluate, register), with
:mod:`~disagg.controller.observe`, :mod:`~disagg.controller.pods` and
:mod:`~disagg.controller.scaling_status`. These names stay only until ``disagg.demo`` imports them from
their modules; nothing else may import this one.
"""

from disagg.controller.pods import POD_DELETION_COST, PodInfo, pod_info, pod_startup_s
from disagg.controller.scaling_status import CONDITION_ACTIVE

__all__ = ["CONDITION_ACTIVE", "POD_DELETION_COST", "PodInfo", "pod_info", "pod_startup_s"]
