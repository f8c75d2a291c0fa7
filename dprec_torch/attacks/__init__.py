"""Privacy attacks used to read epsilon in practical terms (Park & Acharya 2011, Sec. 3.3)."""

from dprec_torch.attacks.lia import (LIAResult, LinearlyAttackable, epsilon_utility, lia_attack, lia_estimate, lia_hit_probability,
                                     topn_difference)

__all__ = ["LIAResult", "LinearlyAttackable", "epsilon_utility", "lia_attack", "lia_estimate", "lia_hit_probability", "topn_difference"]
