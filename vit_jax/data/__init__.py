"""Input: data sources, preprocessing ops and the sharded, resumable loader."""
