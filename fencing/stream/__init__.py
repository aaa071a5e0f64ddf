"""The Spark Structured Streaming job: source, stages, sinks and its driver-side timers."""
