"""The columns of the files a job writes, per kind of log: one definition, below every layer that
needs it (the Spark data sources that produce the files, the table sinks that check a table against
them, the manifest's readers), so none of them reaches up into another for a schema.

pyarrow only: no Spark, no client. The DDL strings are what the Spark data sources declare; the
Arrow schemas are exactly what Spark derives from them (checked by unit tests).
"""

from __future__ import annotations

import pyarrow as pa

STRING_MAP = pa.map_(pa.string(), pa.string())
TIMESTAMP = pa.timestamp("us", tz="UTC")

#: The data source's Spark schema, as a DDL string (what ``DataSource.schema()`` returns).
SPARK_SCHEMA_DDL = (
    "stream STRING, offset LONG, chunk_timestamp TIMESTAMP, body BINARY, "
    "properties MAP<STRING,STRING>, application_properties MAP<STRING,STRING>, "
    "message_annotations MAP<STRING,STRING>"
)

#: Exactly what Spark derives from :data:`SPARK_SCHEMA_DDL` (all fields nullable).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string()),
        pa.field("offset", pa.int64()),
        pa.field("chunk_timestamp", TIMESTAMP),
        pa.field("body", pa.binary()),
        pa.field("properties", STRING_MAP),
        pa.field("application_properties", STRING_MAP),
        pa.field("message_annotations", STRING_MAP),
    ]
)


MEWBASE_SCHEMA_DDL = "stream STRING, offset LONG, timestamp TIMESTAMP, body BINARY, event_json STRING"

#: Exactly what Spark derives from :data:`MEWBASE_SCHEMA_DDL` (checked by a unit test).
MEWBASE_ARROW_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP),
        pa.field("body", pa.binary()),
        pa.field("event_json", pa.string()),
    ]
)
