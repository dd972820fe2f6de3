"""The options' data (plan names, defaults) is the algorithms' own: one list, two places, held equal here."""
from hotcold.distributed import plans
from hotcold.options import sharded


def test_the_options_know_every_plan_by_the_planners_names():
    assert sharded.PLANS == plans.PLANS
