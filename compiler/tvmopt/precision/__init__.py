"""Precision: the roofline, per-kernel costs, the policy (one registry of schemes), the plan
made from a fused module, and the Relax rewrites that realise it."""
