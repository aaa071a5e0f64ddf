"""The job's main file for spark-submit (Kubernetes cluster mode, the Spark Operator):
    spark-submit --py-files local:///opt/herdfence/herdfence-pyfiles.zip local:///opt/herdfence/run_job.py
"""
from fencing.stream.job import main

if __name__ == "__main__":
    main()
