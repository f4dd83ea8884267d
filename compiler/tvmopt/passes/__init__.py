"""tvmopt's own IR passes used by the pipeline phases."""
