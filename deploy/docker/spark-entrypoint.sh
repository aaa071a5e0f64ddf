#!/bin/sh
# Entrypoint of the herdfence job image (modelled on Apache Spark's kubernetes/dockerfiles entrypoint.sh).
#   job                 validate the HERDFENCE_* configuration, then run the streaming job
#                       (python -m fencing.stream.job on HERDFENCE_SPARK_MASTER)
#   topics              create the Kafka topics that are missing (idempotent)
#   driver ...          Spark on Kubernetes driver pod: spark-submit in client mode (args from Spark)
#   executor            Spark on Kubernetes executor pod (env from Spark: SPARK_DRIVER_URL, ...)
#   master | worker URL a Spark standalone master / worker (docker-compose)
#   anything else       exec'd as is
set -e
SPARK_CLASSPATH="${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}${SPARK_HOME}/jars/*"
case "$1" in
  job)
    shift
    python -m deploy.validate          # clear errors for a wrong HERDFENCE_KAFKA / _REDIS / _SPARK_MASTER
    exec python -m fencing.stream.job "$@"
    ;;
  topics)
    exec python -c "from deploy.broker import ensure_topics; from fencing.config import load_settings; print(ensure_topics(load_settings()))"
    ;;
  driver)
    shift
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    exec "${JAVA_HOME}/bin/java" ${SPARK_EXECUTOR_JAVA_OPTS} \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_CLASSPATH}" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  master)
    shift
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
      --host "${SPARK_MASTER_HOST:-0.0.0.0}" --port "${SPARK_MASTER_PORT:-7077}" \
      --webui-port "${SPARK_MASTER_WEBUI_PORT:-8080}" "$@"
    ;;
  worker)
    shift
    exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
      --port "${SPARK_WORKER_PORT:-7078}" --webui-port "${SPARK_WORKER_WEBUI_PORT:-8081}" \
      --cores "${SPARK_WORKER_CORES:-1}" --memory "${SPARK_WORKER_MEMORY:-2g}" "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
