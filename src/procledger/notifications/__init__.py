"""Completion notifications: journalled before dispatch, deduplicated by command id."""
