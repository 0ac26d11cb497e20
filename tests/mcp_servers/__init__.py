"""Real MCP server programs the MCP client is tested against."""
