"""Offline RL on a fixed rollout set: the verified rollouts as token ids (rollouts.py), each
objective's signal, token scope and loss step (objectives.py), the losses as pure tensor
functions (losses.py), the reference side (reference.py) and OREAL's token reward model
(token_rm.py). The stage that drives them is train_offline.py.
"""
