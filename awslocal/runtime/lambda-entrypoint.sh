#!/bin/sh
# The image's entrypoint, as in AWS's base images: the handler is the one argument (the image's
# CMD); without a Runtime API in the environment (a plain `docker run`), the runtime interface
# emulator is started in front of the bootstrap. `sam local` bypasses this script: it runs SAM's
# own emulator (/var/rapid/aws-lambda-rie), which starts /var/runtime/bootstrap itself.
if [ $# -ne 1 ]; then
  echo "entrypoint requires the handler name to be the first argument" 1>&2
  exit 142
fi
export _HANDLER="$1"

if [ -z "${AWS_LAMBDA_RUNTIME_API}" ]; then
  exec /usr/local/bin/aws-lambda-rie /var/runtime/bootstrap
fi
exec /var/runtime/bootstrap
