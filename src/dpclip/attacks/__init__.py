"""Membership-inference attacks on intermediate representations (per layer) and the shadow
model's layer-wise risk estimate built on them."""

from dpclip.attacks.layerwise import CLASSIFIERS, attack_every_layer, membership_attack
from dpclip.attacks.representations import layer_representations, reduce_map

__all__ = ["CLASSIFIERS", "attack_every_layer", "membership_attack", "layer_representations", "reduce_map"]
