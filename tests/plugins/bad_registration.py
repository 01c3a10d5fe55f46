from bench.defense import Defense
from bench.params import Param
from bench.registry import register_defense


@register_defense("Sloppy-Defense")
class Sloppy(Defense):
    version = "latest"
    params = (Param("lr", float, -1.0, "", low=0.0),)
