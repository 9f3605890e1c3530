"""Agent skills shipped with torch-fl: one folder per skill holding its SKILL.md."""
