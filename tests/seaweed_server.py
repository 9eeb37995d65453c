"""The test SeaweedFS: `ister.devcluster.seaweed` (`ister dev up --s3` starts the same server)."""

from ister.devcluster.seaweed import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    SeaweedServer,
    weed_binary,
)

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "SeaweedServer", "weed_binary"]
