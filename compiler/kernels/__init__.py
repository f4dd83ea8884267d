"""Kernels: where default CPU schedule rules and library dispatch (e.g. oneDNN calls through
`R.call_dps_packed`) will land. Empty for now: the pipeline schedules with dlight and
MetaSchedule databases (see tvmopt.pipeline)."""
