"""Autotuning with MetaSchedule: measurement, the database folder, tuning, replay at compile
time, Ctrl-C handling, RPC and the report."""
