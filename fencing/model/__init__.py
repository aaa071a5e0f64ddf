"""The fence model: what the API, ingest and the job share. No Spark here."""
