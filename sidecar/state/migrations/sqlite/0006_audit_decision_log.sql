-- The decision log: each audited call's decision ids (stage -> UUID) and the parts of its policy input the
-- other columns do not hold (principal, tool, time; arguments stay masked), so its decisions can be replayed.

ALTER TABLE audit ADD COLUMN decision_ids TEXT;
ALTER TABLE audit ADD COLUMN decision_input TEXT;
