"""The campaign file: typed models, loading, overrides, consistency and batch arithmetic."""

from pilotrun.campaign.load import apply_overrides, dump_yaml, load_campaign, parse_set
from pilotrun.campaign.schema import Campaign

__all__ = ["Campaign", "apply_overrides", "dump_yaml", "load_campaign", "parse_set"]
