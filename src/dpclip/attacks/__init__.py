"""Membership-inference attacks on intermediate representations (per layer), the shadow
model's layer-wise risk estimate built on them, the class-matched evaluation sets and the
label-only baseline."""

from dpclip.attacks.layerwise import CLASSIFIERS, attack_every_layer, membership_attack
from dpclip.attacks.membership import (class_matched_indices, evaluation_seed, label_only_auc,
                                       label_only_scores)
from dpclip.attacks.representations import layer_representations, reduce_map

__all__ = ["CLASSIFIERS", "attack_every_layer", "membership_attack", "layer_representations",
           "reduce_map", "class_matched_indices", "evaluation_seed", "label_only_auc",
           "label_only_scores"]
