#!/bin/sh
# minio-init (compose): the bucket, the pipeline's user and the device agent's scoped user.
# Idempotent: a second run changes nothing. Runs in the minio/minio image (it ships `mc`).
set -eu

mc alias set egoline http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing "egoline/$S3_BUCKET"

# The policies name the bucket as BUCKET; the agent's confines a device to raw/<its user>/*,
# so one policy serves every device whose MinIO user name is its device id (docs/agent.md).
mkdir -p /tmp/policies
for name in pipeline agent; do
  sed "s/BUCKET/$S3_BUCKET/g" "/init/$name-policy.json" > "/tmp/policies/$name.json"
  mc admin policy create egoline "egoline-$name" "/tmp/policies/$name.json"
done

attach() {  # attach <policy> <user>, tolerating "already attached" on a re-run
  if ! mc admin policy attach egoline "$1" --user "$2" 2>/tmp/attach.err; then
    grep -qi "already" /tmp/attach.err || { cat /tmp/attach.err >&2; exit 1; }
  fi
}

mc admin user add egoline "$PIPELINE_ACCESS_KEY" "$PIPELINE_SECRET_KEY"
attach egoline-pipeline "$PIPELINE_ACCESS_KEY"
mc admin user add egoline "$AGENT_DEVICE_ID" "$AGENT_DEVICE_SECRET"
attach egoline-agent "$AGENT_DEVICE_ID"
echo "minio-init: bucket $S3_BUCKET, users $PIPELINE_ACCESS_KEY (pipeline) and $AGENT_DEVICE_ID (agent)"
