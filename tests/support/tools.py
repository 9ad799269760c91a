"""Two small tool definitions the chat-format tests call."""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}
