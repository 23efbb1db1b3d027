/* conformance report: the data tables (filter, sort, paginate) rendered from JSON blocks.
   Every value from the database goes into the page through textContent or setAttribute, never
   innerHTML, so error messages with markup in them show as text. */
(function () {
  "use strict";

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function fmtNum(v) {
    if (v === null || v === undefined || v === "") return "";
    if (typeof v !== "number") return String(v);
    if (!isFinite(v)) return v > 0 ? "inf" : (v < 0 ? "-inf" : "nan");
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential(2);
    return String(Number(v.toPrecision(3)));
  }

  function fmtInt(v) {
    if (v === null || v === undefined || v === "") return "";
    return typeof v === "number" ? v.toLocaleString("en-US") : String(v);
  }

  function safeHref(h) {
    return typeof h === "string" && !/^\s*(javascript|data|vbscript):/i.test(h) ? h : null;
  }

  function DataTable(host, spec) {
    this.host = host;
    this.spec = spec;
    this.cols = spec.columns;
    this.rows = spec.rows;
    this.rank = spec.statusRank || {};
    this.pageSize = spec.pageSize || 100;
    this.page = 0;
    this.sort = null;
    this.text = "";
    this.selects = {};
    this.statusCol = -1;
    for (var i = 0; i < this.cols.length; i++) if (this.cols[i].key === "status") this.statusCol = i;
    // display order: a column with "after": k is shown right after column k (its data stays in place)
    this.order = [];
    var moved = {};
    this.cols.forEach(function (c, j) { if (typeof c.after === "number") moved[c.after] = (moved[c.after] || []).concat([j]); });
    for (var j = 0; j < this.cols.length; j++) {
      if (typeof this.cols[j].after === "number") continue;
      this.order.push(j);
      (moved[j] || []).forEach(function (m) { this.order.push(m); }, this);
    }
    this.failing = {};
    (spec.failing || []).forEach(function (s) { this.failing[s] = true; }, this);
    this.build();
    if (spec.hashFilter && window.location.hash.length > 1) {  // list.html#name: show that row
      this.text = decodeURIComponent(window.location.hash.slice(1)).toLowerCase();
      this.search.value = this.text;
    }
    if (spec.hashFilter) {  // a link to #name on the same page filters too
      var self = this;
      window.addEventListener("hashchange", function () {
        self.text = decodeURIComponent(window.location.hash.slice(1)).toLowerCase();
        self.search.value = self.text;
        self.page = 0;
        self.apply();
      });
    }
    this.apply();
  }

  DataTable.prototype.value = function (row, i) {
    return i < row.length ? row[i] : null;
  };

  DataTable.prototype.textOf = function (row, i) {
    var c = this.cols[i], v = this.value(row, i);
    if (v === null || v === undefined) return "";
    switch (c.kind) {
      case "link": return v[1] === null ? "" : String(v[1]);
      case "list": return Array.isArray(v) ? v.join(", ") : String(v);
      case "cell": return v[0] || "";
      case "num": return fmtNum(v);
      default: return String(v);
    }
  };

  DataTable.prototype.sortKey = function (row, i) {
    var c = this.cols[i], v = this.value(row, i);
    if (c.kind === "num" || c.kind === "int") return typeof v === "number" ? v : null;
    if (c.kind === "status") return v === null ? -1 : (v in this.rank ? this.rank[v] : 99);
    if (c.kind === "cell") return v === null ? -1 : (v[0] in this.rank ? this.rank[v[0]] : 99);
    return this.textOf(row, i).toLowerCase();
  };

  DataTable.prototype.build = function () {
    var self = this, spec = this.spec;
    var controls = el("div", "dt-controls");
    var search = el("input", "dt-filter");
    search.type = "search";
    search.placeholder = "filter rows…";
    search.setAttribute("aria-label", "filter rows");
    search.addEventListener("input", function () { self.text = search.value.trim().toLowerCase(); self.page = 0; self.apply(); });
    controls.appendChild(search);
    this.search = search;
    (spec.filters || []).forEach(function (f) {
      var values = {};
      self.rows.forEach(function (r) {
        var v = self.value(r, f.col);
        if (f.mode === "has" && Array.isArray(v)) v.forEach(function (x) { values[x] = true; });
        else if (v !== null && v !== undefined && v !== "") values[v] = true;
      });
      var keys = Object.keys(values);
      if (!keys.length) return;
      var statusLike = keys.every(function (k) { return k in self.rank; });
      keys.sort(statusLike ? function (a, b) { return self.rank[a] - self.rank[b]; } : undefined);
      var label = el("label", "dt-select-label", f.label + " ");
      var sel = el("select", "dt-select");
      sel.setAttribute("data-filter", f.label);
      sel.appendChild(el("option", null, "all")).value = "";
      keys.forEach(function (k) { var o = el("option", null, k); o.value = k; sel.appendChild(o); });
      sel.addEventListener("change", function () { self.selects[f.col] = { mode: f.mode, value: sel.value }; self.page = 0; self.apply(); });
      label.appendChild(sel);
      controls.appendChild(label);
    });
    this.info = el("span", "dt-info");
    controls.appendChild(this.info);
    var pager = el("span", "dt-pager");
    this.prev = el("button", "dt-prev", "‹ prev");
    this.next = el("button", "dt-next", "next ›");
    this.prev.type = this.next.type = "button";
    this.prev.addEventListener("click", function () { if (self.page > 0) { self.page--; self.draw(); } });
    this.next.addEventListener("click", function () { if ((self.page + 1) * self.pageSize < self.view.length) { self.page++; self.draw(); } });
    pager.appendChild(this.prev);
    pager.appendChild(this.next);
    controls.appendChild(pager);
    this.host.appendChild(controls);

    var table = el("table", "dt" + (spec.sticky ? " sticky-first" : ""));
    if (spec.id) table.id = spec.id;
    var thead = el("thead"), tr = el("tr");
    this.ths = [];
    this.order.forEach(function (i) {
      var c = self.cols[i];
      if (c.hidden) return;
      var th = el("th", "sortable" + ((c.kind === "num" || c.kind === "int") ? " n" : ""), c.label);
      th.setAttribute("data-col", c.key);
      th.addEventListener("click", function () {
        var dir = self.sort && self.sort.col === i && self.sort.dir === 1 ? -1 : 1;
        self.sort = { col: i, dir: dir };
        self.ths.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
        self.page = 0;
        self.apply();
      });
      self.ths.push(th);
      tr.appendChild(th);
    });
    thead.appendChild(tr);
    table.appendChild(thead);
    this.tbody = el("tbody");
    table.appendChild(this.tbody);
    var wrap = el("div", "dt-wrap" + (spec.sticky ? " scroll" : ""));
    wrap.appendChild(table);
    this.host.appendChild(wrap);
  };

  DataTable.prototype.matches = function (row) {
    for (var k in this.selects) {
      var s = this.selects[k];
      if (!s.value) continue;
      var v = this.value(row, +k);
      if (s.mode === "has") { if (!Array.isArray(v) || v.indexOf(s.value) < 0) return false; }
      else if (String(v) !== s.value) return false;
    }
    if (this.text) {
      if (row._s === undefined) {
        var parts = [];
        for (var i = 0; i < this.cols.length; i++) if (!this.cols[i].hidden) parts.push(this.textOf(row, i));
        Object.defineProperty(row, "_s", { value: parts.join(" \u0001 ").toLowerCase(), enumerable: false });
      }
      if (row._s.indexOf(this.text) < 0) return false;
    }
    return true;
  };

  DataTable.prototype.apply = function () {
    var self = this;
    this.view = this.rows.filter(function (r) { return self.matches(r); });
    if (this.sort) {
      var i = this.sort.col, dir = this.sort.dir;
      var keyed = this.view.map(function (r, n) { return [self.sortKey(r, i), n, r]; });
      keyed.sort(function (a, b) {
        var x = a[0], y = b[0];
        if (x === y) return a[1] - b[1];
        if (x === null) return 1;
        if (y === null) return -1;
        return (x < y ? -1 : 1) * dir;
      });
      this.view = keyed.map(function (k) { return k[2]; });
    }
    this.draw();
  };

  DataTable.prototype.cell = function (row, i) {
    var c = this.cols[i], v = this.value(row, i), td = el("td");
    td.setAttribute("data-col", c.key);
    switch (c.kind) {
      case "link":
        if (v && safeHref(v[0])) { var a = el("a", null, v[1]); a.setAttribute("href", safeHref(v[0])); td.appendChild(a); }
        else if (v) td.textContent = v[1] === null ? "" : String(v[1]);
        break;
      case "linkto":  // a value shown as a link to the column's "href" with {} replaced by the value
        if (v !== null && v !== undefined && v !== "") {
          var la = el("a", null, v); la.setAttribute("href", String(c.href).replace("{}", encodeURIComponent(String(v)))); td.appendChild(la);
        }
        break;
      case "status":
        if (v !== null && v !== undefined) td.appendChild(el("span", "badge st-" + String(v).replace(/[^a-z_]/g, ""), v));
        break;
      case "cell":
        if (v) {
          td.className = "cell st-" + String(v[0]).replace(/[^a-z_]/g, ""); td.setAttribute("title", v[1]); td.setAttribute("data-status", v[0]);
          // [worst, tooltip, samples, contracts, href, text]: a cell may link somewhere and say more than its count
          var words = v.length > 5 && v[5] !== null ? String(v[5]) : fmtInt(v[2]);
          if (v.length > 4 && safeHref(v[4])) { var ca = el("a", null, words); ca.setAttribute("href", safeHref(v[4])); td.appendChild(ca); }
          else td.textContent = words;
          var mark = this.cellMark();  // a filter that selects cells too: the others are dimmed
          if (mark && !(Array.isArray(v[mark.at]) && v[mark.at].indexOf(mark.value) >= 0)) td.className += " dim";
        }
        else td.className = "cell none";
        break;
      case "num": td.className = "n"; td.textContent = fmtNum(v); if (typeof v === "number") td.setAttribute("title", String(v)); break;
      case "int": td.className = "n"; td.textContent = fmtInt(v); break;
      case "list": td.className = "list"; td.textContent = Array.isArray(v) ? v.join(", ") : (v === null ? "" : String(v)); break;
      case "pre": td.className = "pre"; td.textContent = v === null ? "" : String(v); break;
      case "repro":
        td.className = "repro";
        if (this.statusCol >= 0 && this.failing[this.value(row, this.statusCol)]) {
          td.appendChild(el("code", null, "conformance repro " + this.value(row, c.ref || 0) + " --db " + this.spec.db));
        }
        break;
      default: td.textContent = v === null || v === undefined ? "" : String(v);
    }
    return td;
  };

  // The value of an active filter whose spec has "cells": N (the index, in a cell's array, of the
  // list it matches), or null.
  DataTable.prototype.cellMark = function () {
    var filters = this.spec.filters || [];
    for (var i = 0; i < filters.length; i++) {
      var f = filters[i], s = this.selects[f.col];
      if (f.cells !== undefined && s && s.value) return { at: f.cells, value: s.value };
    }
    return null;
  };

  DataTable.prototype.draw = function () {
    var n = this.view.length, start = this.page * this.pageSize, end = Math.min(n, start + this.pageSize);
    var frag = document.createDocumentFragment();
    for (var r = start; r < end; r++) {
      var row = this.view[r], tr = el("tr");
      for (var k = 0; k < this.order.length; k++) if (!this.cols[this.order[k]].hidden) tr.appendChild(this.cell(row, this.order[k]));
      frag.appendChild(tr);
    }
    this.tbody.textContent = "";
    this.tbody.appendChild(frag);
    var info = n ? (start + 1).toLocaleString("en-US") + "–" + end.toLocaleString("en-US") + " of " + n.toLocaleString("en-US") : "no rows";
    if (n !== this.rows.length) info += " (filtered from " + this.rows.length.toLocaleString("en-US") + ")";
    this.info.textContent = info;
    this.info.setAttribute("data-shown", String(n));
    this.prev.disabled = this.page === 0;
    this.next.disabled = end >= n;
  };

  function init() {
    var hosts = document.querySelectorAll(".datatable[data-spec]");
    for (var i = 0; i < hosts.length; i++) {
      var src = document.getElementById(hosts[i].getAttribute("data-spec"));
      if (!src) continue;
      try { new DataTable(hosts[i], JSON.parse(src.textContent)); }
      catch (e) { hosts[i].appendChild(el("p", "empty", "table failed to load: " + e)); }
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
