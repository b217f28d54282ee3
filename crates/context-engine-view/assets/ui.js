// ctx serve's /ui: filled in by the live page (phase 2).
'use strict';
