"""Host bindings: the standalone preview (``cudapatch run``) and TouchDesigner."""
