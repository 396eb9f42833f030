"""OpenAPI descriptions of the clusters app's authentication schemes (drf-spectacular extensions)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """Node agents authenticate their reports with ``Authorization: Agent <secret>``."""

    target_class = "apps.clusters.agent_api.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "A cluster's node agent token: `Authorization: Agent <secret>`.",
        }
