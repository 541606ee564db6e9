"""Hooks of scripts/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

`POST /v1/votes` of `jurystream connect` takes NDJSON
(`application/x-ndjson`, src/connect/openapi.json): a text body, sent as
schemathesis sends `text/plain`.
"""

import schemathesis

schemathesis.serializer.alias("application/x-ndjson", "text/plain")
