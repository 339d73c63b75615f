"""What the attacks and the stages around them share: the class-matched membership game and
the label-only baseline (:mod:`~dpclip.attacks.common.membership`), per-record statistics of
model outputs (:mod:`~dpclip.attacks.common.signals`), and the layer-wise attacks on
intermediate representations behind the shadow stage's risk estimate and the IR-level MIA
(:mod:`~dpclip.attacks.common.layerwise`, :mod:`~dpclip.attacks.common.representations`).
Nothing here is an attack of the registry: the discovery skips this package. It imports none of
its modules, so that code importing one depends on that one only."""
