"""Analyses over compiled modules: the roofline cost model (`roofline`)."""
