"""Tools: the ``Tool`` record and ``@tool``, pipeline vocabulary, opt-in built-in tools.

``loader.load_tool_ref`` loads the tools a ``package.module:attr`` reference names.
"""
