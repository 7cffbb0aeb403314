"""Preloaded by the verifier pool's fork server: math-verify imported and warmed up once there,
so every worker it forks (and every replacement of a timed-out one) starts warm."""

from reasoner.verify.rules import warm_up

warm_up()
