"""A verl ``@function_tool`` file, as verl's ``multi_turn.function_tool_path`` names one (verl executes it
by path; nothing imports it as a module). Imports verl."""
from verl.tools.function_tool import function_tool


@function_tool
def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: the text to upper-case.
    """
    return text.upper() + "!"
