-- compatible-from: 31
-- A placeholder for migration 0032 of the wf-cancel branch (issue #25, point 2), so that
-- 0033 can be numbered as reserved: migrations are numbered without gaps. It does
-- nothing. DELETE THIS FILE when that branch's 0032 is merged beside it.
SELECT 1;
