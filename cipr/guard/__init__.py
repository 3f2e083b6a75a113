"""Inference-time guard: a versioned tool contract, a validator with structured reports, bounded
repair with candidate-set retry, the naive-retry and tool-list baselines, an audit log, drift
metrics and evaluation, and a release-gate interface diff (Hemimy's guide and the
SchemaShield-Lite study, docs/references.md)."""

from cipr.guard.audit import AuditLog, AuditRecord, read_audit
from cipr.guard.backend import FunctionBackend, ScriptedBackend
from cipr.guard.cards import ToolCard, tool_card
from cipr.guard.contract import ContractSnapshot
from cipr.guard.diff import DiffConfig, DiffReport, diff_interfaces, load_tool_list
from cipr.guard.guard import POLICIES, Guard, GuardConfig, GuardOutcome
from cipr.guard.validator import (
    CallValidator,
    ValidationIssue,
    ValidationReport,
    ValidatorConfig,
    validate_call,
)
from cipr.runtime.backends import Backend, HFBackend, Usage

__all__ = [
    "AuditLog", "AuditRecord", "Backend", "CallValidator", "ContractSnapshot", "DiffConfig", "DiffReport",
    "FunctionBackend", "Guard", "GuardConfig", "GuardOutcome", "HFBackend", "POLICIES", "ScriptedBackend",
    "ToolCard", "Usage", "ValidationIssue", "ValidationReport", "ValidatorConfig", "diff_interfaces",
    "load_tool_list", "read_audit", "tool_card", "validate_call",
]
