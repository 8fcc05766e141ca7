-- Reserved: schema version 0008 is object storage's (another change of this release). This
-- placeholder keeps the numbering without a gap until that step lands in its place.
SELECT 1;
