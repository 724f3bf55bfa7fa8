"""An OCI registry as a cache store: ``cache push ARCHIVE oci://HOST[:PORT]/REPO[:TAG]`` and
``cache pull oci://...`` (docs/cache.md, "OCI registries").  ``reference`` parses the
references, ``auth`` finds credentials and reads challenges, ``client`` speaks the registry's
HTTP API, ``artifact`` is the artifact's layout (one layer per cache kind), ``push`` and
``pull`` are the two directions."""

from cache_tools.stores.oci.pull import OciPullPlan, plan_pull
from cache_tools.stores.oci.push import OciPushResult, check_access, push
from cache_tools.stores.oci.reference import Reference, is_reference, parse

__all__ = ["OciPullPlan", "OciPushResult", "Reference", "check_access", "is_reference", "parse",
           "plan_pull", "push"]
