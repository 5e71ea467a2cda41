"""Tools: the ``Tool`` record and ``@tool``, pipeline vocabulary, and opt-in built-in tools."""
