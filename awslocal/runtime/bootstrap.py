"""Start awslambdaric with the python3.12 runtime's module search order.

Lambda documents it: the function's folder, then the layers (/opt/python/lib/python3.12/
site-packages, /opt/python), then the standard library and /var/runtime (awslambdaric, boto3)
last, so that a layer's boto3 wins over the runtime's.
"""

import os
import sys

task_root = os.environ.get("LAMBDA_TASK_ROOT", "/var/task")
runtime_dir = os.environ.get("LAMBDA_RUNTIME_DIR", "/var/runtime")
here = {os.path.realpath(p) for p in (os.path.dirname(__file__), runtime_dir)}  # noqa: PTH120
# The interpreter put this script's folder (/var/runtime) first: it goes to the end instead.
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") not in here]
sys.path[:0] = [task_root, "/opt/python/lib/python3.12/site-packages", "/opt/python"]
sys.path.append(runtime_dir)

from awslambdaric import __main__ as ric  # noqa: E402  (after the search path is set)

handler = os.environ.get("_HANDLER") or os.environ.get("AWS_LAMBDA_FUNCTION_HANDLER", "")
ric.main([sys.argv[0], handler])
